"""Replay: copy what happened in one env (or a workload trace) into another env's inputs,
preserving keys, per-key order and relative timing at a chosen speed-up."""
