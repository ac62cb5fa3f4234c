"""A toy reinforcement-learning job of five roles that find each other by address, as
DI-engine's coordinator, collectors, learner and aggregator do under DI-orchestrator.

One program, its role from the platform (DLROVER_EVENTS_ROLE); every role serves JSON over
HTTP on the port the platform gives it, and reaches the others at the addresses the SDK's
``cluster_info()`` reads (a file the platform keeps current as the job is scaled):

- coordinator: starts first, says ``ready()`` once it serves (the others start after it:
  ``startAfter``), follows the learner's steps, and grows the collectors from 2 to 4 and
  back through the job's own scale API (``scale()``: its role ``scales`` collector), then
  asks for more than the job's bounds and prints the refusal; ends the job at the last
  step (it is the job's success role);
- collector: plays a contextual bandit (a context of 4 numbers, 3 arms, the best arm a
  fixed linear function of the context) with the learner's current policy, and sends the
  episodes that paid to the learner;
- learner (torch): fits its linear policy to the arms that paid (cross-entropy), its
  gradient averaged by the aggregator each step, and reports its loss to the coordinator;
- aggregator: averages the learners' gradients of a step (one learner here: its own).

A peer that is not up yet (or was replaced: its address is its rank's) is retried.
Tiny and on CPU: a step is a few milliseconds. The sizes are flags (``--steps``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dlrover_events.sdk.cluster import ScaleRefused, cluster_info, ready, scale

ARMS, FEATURES = 3, 4
#: seconds the coordinator waits, once done, for the learner's policy on the shared volume
POLICY_WAIT_S = 30.0
#: the bandit's truth: the best arm of a context is argmax(TRUTH @ context)
TRUTH = [[1.0, -0.5, 0.3, 0.0], [-0.8, 1.0, 0.0, 0.4], [0.1, 0.2, -1.0, 1.0]]


def say(*parts: Any) -> None:
    print(f"{os.environ.get('DLROVER_EVENTS_ROLE', '?')}:", *parts, flush=True)


def serve(port: int, routes: dict[str, Callable[[dict[str, Any]], Any]]) -> ThreadingHTTPServer:
    """JSON over HTTP on ``port``: POST /<route> with a JSON body (GET: an empty one)."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            route = routes.get(self.path.strip("/"))
            if route is None:
                self.send_error(404)
                return
            data = json.dumps(route(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def call(address: str, route: str, body: Any = None, timeout_s: float = 5.0) -> Any:
    """One call to a peer; OSError when it does not answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{address}/{route}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def until_answered(address: str, route: str, body: Any = None, give_up_s: float = 60.0) -> Any:
    """A call retried until the peer answers: it may not be up yet, or be replaced."""
    deadline = time.monotonic() + give_up_s
    while True:
        try:
            return call(address, route, body)
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def peer(role: str, rank: int = 0) -> str:
    """The address of ``role``'s pod of ``rank``, as the platform says it now."""
    addresses = cluster_info().addresses(role)
    if rank >= len(addresses):
        raise LookupError(f"the job has no {role} {rank} now")
    return addresses[rank]


# -- coordinator -------------------------------------------------------------------------


def coordinator(args: argparse.Namespace) -> int:
    info = cluster_info()
    state: dict[str, Any] = {"step": 0, "done": False, "collectors": set(), "losses": []}
    lock = threading.Lock()

    def report(body: dict[str, Any]) -> dict[str, Any]:
        with lock:
            state["step"] = max(state["step"], int(body.get("step", 0)))
            if "loss" in body:
                state["losses"].append(float(body["loss"]))
            if "collector" in body:
                state["collectors"].add(int(body["collector"]))
            return {"done": state["done"]}

    assert info.port is not None, "the platform gave this pod no port"
    serve(info.port, {"report": report, "state": lambda _: {"done": state["done"]}})
    time.sleep(args.warmup_s)  # a coordinator that takes a while to be ready
    ready()
    say("ready at", info.address)

    def wait(what: str, check: Callable[[], bool]) -> None:
        while True:
            with lock:
                if check():
                    return
            time.sleep(0.05)

    wait("learning", lambda: state["step"] >= args.grow_at)
    answer = scale("collector", args.collectors_max)
    say(f"grew collectors to {args.collectors_max}: plan {answer['plan_id']} by {answer['source']}")
    wait("collectors", lambda: len(state["collectors"]) >= args.collectors_max)
    say(f"heard from collectors {sorted(state['collectors'])}")
    wait("more learning", lambda: state["step"] >= args.shrink_at)
    answer = scale("collector", args.collectors)
    say(f"shrank collectors to {args.collectors}: plan {answer['plan_id']}")
    try:
        scale("collector", args.collectors_max + 5)
        say("a scale beyond the bounds was accepted")
    except ScaleRefused as e:
        say(f"refused as it should be: {e}")
    while cluster_info().addresses("collector") != info.addresses("collector")[: args.collectors]:
        time.sleep(0.1)
    say(f"collectors back to {len(cluster_info().addresses('collector'))}")
    wait("the last step", lambda: state["step"] >= args.steps)
    with lock:
        state["done"] = True
        losses = state["losses"]
    say(f"done at step {state['step']}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    shared = info.volume("shared")
    deadline = time.monotonic() + args.linger_s  # the others hear it is done, then end too
    # the learner writes its policy once its next report hears of the end: seconds on a
    # loaded machine, longer than the linger (a 2 s linger missed it in a CI run)
    policy_by = time.monotonic() + max(args.linger_s, POLICY_WAIT_S)
    while shared is not None and time.monotonic() < policy_by:
        saved = shared / "policy.json"
        if saved.exists():
            say(f"the learner's policy, read from the shared volume: {saved.read_text()}")
            break
        time.sleep(0.1)
    time.sleep(max(0.0, deadline - time.monotonic()))
    return 0


def done(coordinator_address: str) -> bool:
    """Whether the coordinator says the job is done; True when it is gone for good."""
    try:
        return bool(until_answered(coordinator_address, "state", give_up_s=10.0)["done"])
    except (OSError, urllib.error.URLError):
        return True


# -- collector ---------------------------------------------------------------------------


def best_arm(context: list[float]) -> int:
    scores = [sum(w * x for w, x in zip(row, context, strict=True)) for row in TRUTH]
    return scores.index(max(scores))


def act(weights: list[list[float]], context: list[float], rng: random.Random) -> int:
    import math

    logits = [sum(w * x for w, x in zip(row, context, strict=True)) for row in weights]
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    pick, total = rng.random() * sum(exps), 0.0
    for arm, e in enumerate(exps):
        total += e
        if pick <= total:
            return arm
    return ARMS - 1


def collector(args: argparse.Namespace) -> int:
    info = cluster_info()
    rng = random.Random(info.rank)
    coordinator_at = peer("coordinator")
    until_answered(coordinator_at, "report", {"collector": info.rank})
    say(f"collector {info.rank} at {info.address} working for {coordinator_at}")
    episodes = 0
    while not done(coordinator_at):
        weights = until_answered(peer("learner"), "policy")["weights"]
        paid = []
        for _ in range(args.batch):
            context = [rng.uniform(-1, 1) for _ in range(FEATURES)]
            arm = act(weights, context, rng)
            if arm == best_arm(context):
                paid.append({"context": context, "arm": arm})
        episodes += args.batch
        until_answered(peer("learner"), "data", {"episodes": paid})
        time.sleep(args.collect_sleep_s)
    say(f"collector {info.rank} done after {episodes} episodes")
    return 0


# -- learner ----------------------------------------------------------------------------


def learner(args: argparse.Namespace) -> int:
    import torch

    torch.manual_seed(0)
    info = cluster_info()
    model = torch.nn.Linear(FEATURES, ARMS, bias=False)
    lock = threading.Lock()
    buffer: list[dict[str, Any]] = []

    def policy(_: dict[str, Any]) -> dict[str, Any]:
        with lock:
            return {"weights": model.weight.detach().tolist()}

    def data(body: dict[str, Any]) -> dict[str, Any]:
        with lock:
            buffer.extend(body.get("episodes") or [])
            del buffer[: max(0, len(buffer) - 4096)]
            return {"kept": len(buffer)}

    assert info.port is not None, "the platform gave this pod no port"
    serve(info.port, {"policy": policy, "data": data})
    coordinator_at = peer("coordinator")
    say(f"learner at {info.address}")
    step = 0
    while True:
        with lock:
            batch = random.sample(buffer, min(len(buffer), 64)) if len(buffer) >= 16 else []
        if not batch:
            time.sleep(0.05)
            continue
        x = torch.tensor([b["context"] for b in batch])
        y = torch.tensor([b["arm"] for b in batch])
        with lock:
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            assert model.weight.grad is not None
            grad = model.weight.grad.tolist()
        # the aggregator averages the learners' gradients of this step
        averaged = until_answered(
            peer("aggregator"), "grad", {"step": step, "rank": info.rank, "grad": grad}
        )["grad"]
        with lock, torch.no_grad():
            model.weight -= args.lr * torch.tensor(averaged)
        step += 1
        said = until_answered(coordinator_at, "report", {"step": step, "loss": loss.item()})
        if step % 10 == 0:
            say(f"step {step} loss {loss.item():.4f}")
        if said["done"]:
            shared = info.volume("shared")
            if shared is not None:  # the job's volume, which the coordinator mounts too
                (shared / "policy.json").write_text(json.dumps(policy({})))
            say(f"done at step {step}")
            return 0
        time.sleep(args.step_sleep_s)


# -- aggregator -------------------------------------------------------------------------


def aggregator(args: argparse.Namespace) -> int:
    info = cluster_info()
    rounds: dict[int, dict[int, list[list[float]]]] = {}
    cond = threading.Condition()
    served = [0]

    def grad(body: dict[str, Any]) -> dict[str, Any]:
        step, rank = int(body["step"]), int(body["rank"])
        learners = max(1, len(cluster_info().addresses("learner")))
        with cond:
            rounds.setdefault(step, {})[rank] = body["grad"]
            cond.wait_for(lambda: len(rounds[step]) >= learners, timeout=5.0)
            got = list(rounds[step].values())
            mean = [
                [sum(g[i][j] for g in got) / len(got) for j in range(len(got[0][0]))]
                for i in range(len(got[0]))
            ]
            cond.notify_all()
            for old in [s for s in rounds if s < step - 8]:
                del rounds[old]
            served[0] += 1
            if served[0] == 1 or served[0] % 20 == 0:
                say(f"aggregated {served[0]} rounds (last: step {step}, {len(got)} learner(s))")
        return {"grad": mean}

    assert info.port is not None, "the platform gave this pod no port"
    serve(info.port, {"grad": grad})
    say(f"aggregator at {info.address}")
    coordinator_at = peer("coordinator")
    while not done(coordinator_at):
        time.sleep(0.5)
    say(f"aggregator done after {served[0]} rounds")
    return 0


ROLES = {
    "coordinator": coordinator,
    "collector": collector,
    "learner": learner,
    "aggregator": aggregator,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="learner steps to the end")
    parser.add_argument("--grow-at", type=int, default=10, help="step to grow collectors at")
    parser.add_argument("--shrink-at", type=int, default=40, help="step to shrink them at")
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--collectors-max", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="episodes per collection")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--linger-s", type=float, default=3.0)
    parser.add_argument("--collect-sleep-s", type=float, default=0.05)
    parser.add_argument("--step-sleep-s", type=float, default=0.02)
    args = parser.parse_args(argv)
    role = os.environ.get("DLROVER_EVENTS_ROLE", "")
    if role not in ROLES:
        print(f"DLROVER_EVENTS_ROLE must be one of {', '.join(ROLES)}, got {role!r}")
        return 2
    return ROLES[role](args)


if __name__ == "__main__":
    sys.exit(main())
