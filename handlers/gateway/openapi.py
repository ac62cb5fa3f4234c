"""The OpenAPI 3.1 document of the gateway, served at /openapi.json.

Written by hand next to the routes, with the document schema taken from the pydantic
model, so what clients (and schemathesis) are told is what the handlers enforce.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from pydantic.json_schema import models_json_schema

from dlrover_events.config.matching import MAX_KEY
from handlers.gateway.http_rules import IF_MATCH, INT32
from handlers.gateway.plans import MAX_JOB, OptimizeBody
from schemas.bounds import MAX_CONFIG_DOCUMENT_BYTES, MAX_DOCUMENT_DEPTH, MAX_DOCUMENT_VALUES
from schemas.config import ConfigDocument
from schemas.plans import JobPlan, OptimizePlan

#: Limits the handlers enforce, stated here so the document says them too.
MAX_VALUE = 256
MAX_ETAGS = 1024
#: The job uuid the document shows as an example (the schemathesis run has that job).
JOB_EXAMPLE = "0b9e7d2c-5f4a-4c61-9a57-3d2f8e1b6a40"
#: Longest long-poll (?wait=) of /v1/config and a job's plan; proxies commonly cut idle
#: requests at 60 s.
MAX_WAIT_S = 60.0
#: POST /v1/jobs/{job}/optimize: the body's bound, and how long it waits for the plan.
MAX_OPTIMIZE_BODY = 64 * 1024
OPTIMIZE_TIMEOUT_S = 10.0
MAX_OPTIMIZE_TIMEOUT_S = 60.0

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: "bad input (query, JSON or version)",
        401: "no token, or an unknown or revoked one",
        403: "a token of another env, or without the needed scope",
        404: "no such document (or job)",
        408: "the body did not arrive within the body timeout",
        409: "the version is not the current one, or the name exists",
        412: "If-Match holds a weak entity tag, which never matches",
        413: "body too large",
        422: "the document does not validate",
        428: "the version being changed was not given",
        503: "a dependency (bus, Postgres) is unavailable, the index is not ready, too"
        " many long-polls are waiting, or the gateway is stopping (Retry-After)",
        504: "no answer in time",
    }
    return {str(c): {**_json(_ref("Error"), why[c])} for c in codes}


def _document_schemas() -> dict[str, Any]:
    doc = ConfigDocument.model_json_schema(by_alias=True, ref_template=_REF)
    props = doc["properties"]
    props["priority"].update(minimum=-INT32, maximum=INT32)
    props["version"]["maximum"] = INT32
    for part in ("Include", "Exclude"):
        props[part]["propertyNames"] = {"minLength": 1, "maxLength": MAX_KEY}
        any_of = props[part]["additionalProperties"]["anyOf"]
        for alt in any_of:
            if alt.get("type") == "array":
                alt["minItems"] = 1
    update = copy.deepcopy(doc)
    update["required"] = [r for r in update.get("required", []) if r != "name"]
    update["title"] = "DocumentUpdate"
    update["description"] = (
        "A document replacing the current one; `name` defaults to the URL's, and `version`"
        " (when no If-Match header is sent) is the version being replaced."
    )
    doc["description"] = (
        "A config document. Include: every condition must hold; Exclude: none may hold; a"
        " list means any of; attribute names compare case-insensitively. `version` and"
        " `updated_at` are assigned by the server. Bounds (422/413 past them, the bound in"
        f" the message): at most {MAX_DOCUMENT_VALUES} values, nested at most"
        f" {MAX_DOCUMENT_DEPTH} deep in Configure, integers within int64, no NUL, and"
        f" {MAX_CONFIG_DOCUMENT_BYTES} bytes as JSON."
    )
    return {"ConfigDocument": doc, "DocumentUpdate": update}


def _plan_schemas() -> dict[str, Any]:
    """JobPlan and OptimizePlan as they are sent (serialization), OptimizeBody as it is
    taken (validation); the models they share (JobMeta, ScalePlan, ...) are components."""
    _, top = models_json_schema(
        [
            (JobPlan, "serialization"),
            (OptimizePlan, "serialization"),
            (OptimizeBody, "validation"),
        ],
        ref_template=_REF,
    )
    return dict(top["$defs"])


ATTRIBUTES = ("user", "group", "cluster", "namespace", "app", "scenario", "job")


@cache
def openapi_document() -> dict[str, Any]:
    doc_schemas = _document_schemas()
    name_param = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": doc_schemas["ConfigDocument"]["properties"]["name"]["pattern"],
        },
    }
    if_match = {
        "name": "If-Match",
        "in": "header",
        "required": True,
        "description": 'the version being changed, as a quoted strong entity tag "<n>" (the'
        " document's ETag; RFC 9110 8.8.3): a bare number is a 400, a weak tag a 412",
        "schema": {"type": "string", "pattern": IF_MATCH},
    }
    config_params: list[dict[str, Any]] = [
        {
            "name": attr,
            "in": "query",
            "required": False,
            "description": f"the job's {attr}",
            "schema": {"type": "string", "maxLength": MAX_VALUE},
        }
        for attr in ATTRIBUTES
    ]
    config_params += [
        {
            "name": "wait",
            "in": "query",
            "required": False,
            "description": "with If-None-Match: wait up to this many seconds for a change",
            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
        },
        {
            "name": "If-None-Match",
            "in": "header",
            "required": False,
            "description": "the ETag of the answer the job has",
            "schema": {"type": "string", "maxLength": MAX_ETAGS},
        },
    ]
    doc_response = {
        "description": "the stored document",
        "headers": {"ETag": {"schema": {"type": "string"}, "description": "its version"}},
        "content": {"application/json": {"schema": _ref("ConfigDocument")}},
    }
    admin: dict[str, Any] = {"security": [{"bearer": []}]}
    job_param = {
        "name": "job",
        "in": "path",
        "required": True,
        "description": "the job's uuid (its key on the bus)",
        "example": JOB_EXAMPLE,
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_JOB},
    }
    etag_header = {"ETag": {"schema": {"type": "string"}, "description": "a strong tag"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dlrover-events config gateway",
            "version": "1.0.0",
            "description": (
                "Training jobs fetch their merged configuration; operators manage the"
                " Include/Exclude/Configure documents. Bearer tokens per env: `read` for"
                " jobs, `admin` for documents (admin includes read). Any other query"
                " parameter of /v1/config is a job attribute too (labels.<name>, ...)."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "liveness",
                    "security": [],
                    "responses": {"200": _json(_ref("Status"), "alive")},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "readiness: the index has caught up with the feed, and the"
                    " job and plan topics were read to their end",
                    "security": [],
                    "responses": {
                        "200": _json(_ref("Ready"), "ready"),
                        "503": _json(_ref("Ready"), "still catching up"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_errors(401, 403),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": {
                        "200": _json({"type": "object"}, "OpenAPI 3.1"),
                        **_errors(401, 403),
                    },
                }
            },
            "/v1/config": {
                "get": {
                    "summary": "the merged config of a job, and which documents it came from",
                    "parameters": config_params,
                    "responses": {
                        "200": {
                            "description": "the merged config",
                            "headers": {"ETag": {"schema": {"type": "string"}}},
                            "content": {"application/json": {"schema": _ref("ConfigAnswer")}},
                        },
                        "304": {
                            "description": "unchanged (If-None-Match), also after a wait",
                            "headers": {"ETag": {"schema": {"type": "string"}}},
                        },
                        **_errors(400, 401, 403, 503),
                    },
                }
            },
            "/v1/jobs/{job}/plan": {
                "parameters": [job_param],
                "get": {
                    "summary": "the job's latest plan: its OptimizePlan, ScalePlan, the"
                    " operator's result of that ScalePlan and its latest TrainingApplied",
                    "parameters": [
                        {
                            "name": "wait",
                            "in": "query",
                            "required": False,
                            "description": "with If-None-Match: wait up to this many seconds"
                            " for the job's plan to change",
                            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                        },
                        {
                            "name": "If-None-Match",
                            "in": "header",
                            "required": False,
                            "description": "the ETag of the plan the job has",
                            "schema": {"type": "string", "maxLength": MAX_ETAGS},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the job's plan",
                            "headers": etag_header,
                            "content": {"application/json": {"schema": _ref("JobPlan")}},
                        },
                        "304": {
                            "description": "unchanged (If-None-Match), also after a wait",
                            "headers": etag_header,
                        },
                        **_errors(400, 401, 403, 404, 503),
                    },
                },
            },
            "/v1/jobs/{job}/optimize": {
                "parameters": [job_param],
                "post": {
                    "summary": "ask the brain for a plan now; answered with its OptimizePlan",
                    "description": (
                        "Publishes an OptimizeRequest for the job (its meta as its"
                        " job.submitted says) to <env>.job.events and waits for the"
                        " OptimizePlan whose caused_by is the request's event id. The"
                        " brain publishes none when the optimizers propose no change or"
                        " the same as last time: then 504, the request staying published."
                    ),
                    "parameters": [
                        {
                            "name": "timeout",
                            "in": "query",
                            "required": False,
                            "description": "how long to wait for the plan, in seconds"
                            f" (default {OPTIMIZE_TIMEOUT_S:g})",
                            "schema": {
                                "type": "number",
                                "exclusiveMinimum": 0,
                                "maximum": MAX_OPTIMIZE_TIMEOUT_S,
                            },
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("OptimizeBody")}},
                    },
                    "responses": {
                        "200": {
                            "description": "the brain's plan for the request",
                            "headers": {
                                "X-Request-Event-Id": {
                                    "schema": {"type": "string"},
                                    "description": "the OptimizeRequest's event id",
                                }
                            },
                            "content": {"application/json": {"schema": _ref("OptimizePlan")}},
                        },
                        "409": _json(_ref("Error"), "the job has finished"),
                        **_errors(400, 401, 403, 404, 408, 413, 422, 503, 504),
                    },
                },
            },
            "/v1/documents": {
                "get": {
                    **admin,
                    "summary": "all documents",
                    "responses": {
                        "200": _json(_ref("DocumentList"), "documents by name"),
                        **_errors(401, 403, 503),
                    },
                },
                "post": {
                    **admin,
                    "summary": "create a document (version 1, or the next after a delete)",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("ConfigDocument")}},
                    },
                    "responses": {
                        "201": {**doc_response, "description": "created"},
                        **_errors(400, 401, 403, 408, 409, 413, 422, 503),
                    },
                },
            },
            "/v1/documents/{name}": {
                "parameters": [name_param],
                "get": {
                    **admin,
                    "summary": "one document",
                    "responses": {"200": doc_response, **_errors(400, 401, 403, 404, 503)},
                },
                "put": {
                    **admin,
                    "summary": "replace a document at a known version",
                    "parameters": [if_match],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("DocumentUpdate")}},
                    },
                    "responses": {
                        "200": {**doc_response, "description": "updated"},
                        **_errors(400, 401, 403, 404, 408, 409, 412, 413, 422, 428, 503),
                    },
                },
                "delete": {
                    **admin,
                    "summary": "delete a document at a known version",
                    "parameters": [if_match],
                    "responses": {
                        "200": _json(_ref("Deleted"), "deleted"),
                        **_errors(400, 401, 403, 404, 409, 412, 428, 503),
                    },
                },
            },
            "/v1/history/{name}": {
                "parameters": [name_param],
                "get": {
                    **admin,
                    "summary": "every version of a document, deletions included",
                    "responses": {
                        "200": _json(_ref("History"), "oldest first"),
                        **_errors(400, 401, 403, 404, 503),
                    },
                },
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **doc_schemas,
                **_plan_schemas(),
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["status", "code", "message"],
                            "properties": {
                                "status": {"type": "integer"},
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "details": {},
                            },
                        }
                    },
                },
                "Status": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"type": "string"}},
                },
                "Ready": {
                    "type": "object",
                    "required": ["ready", "bus", "documents", "jobs"],
                    "properties": {
                        "ready": {"type": "boolean"},
                        "bus": {
                            "type": "boolean",
                            "description": "false while the broker is away (not ready then)",
                        },
                        "documents": {"type": "integer"},
                        "jobs": {"type": "integer", "description": "jobs whose plan is kept"},
                    },
                },
                "ConfigAnswer": {
                    "type": "object",
                    "required": ["env", "config", "sources", "origin"],
                    "properties": {
                        "env": {"type": "string"},
                        "config": {"type": "object"},
                        "sources": {
                            "type": "array",
                            "description": "contributing documents, the winner first",
                            "items": {
                                "type": "object",
                                "required": ["name", "version", "specificity", "priority"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "version": {"type": "integer"},
                                    "specificity": {"type": "integer"},
                                    "priority": {"type": "integer"},
                                },
                            },
                        },
                        "origin": {
                            "type": "object",
                            "description": "top-level key -> the document whose value won",
                            "additionalProperties": {"type": "string"},
                        },
                    },
                },
                "DocumentList": {
                    "type": "object",
                    "required": ["documents"],
                    "properties": {"documents": {"type": "array", "items": _ref("ConfigDocument")}},
                },
                "Deleted": {
                    "type": "object",
                    "required": ["name", "version", "deleted"],
                    "properties": {
                        "name": {"type": "string"},
                        "version": {"type": "integer"},
                        "deleted": {"type": "boolean"},
                    },
                },
                "History": {
                    "type": "object",
                    "required": ["name", "history"],
                    "properties": {
                        "name": {"type": "string"},
                        "history": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["version", "op", "document", "changed_at"],
                                "properties": {
                                    "version": {"type": "integer"},
                                    "op": {"enum": ["upsert", "delete"]},
                                    "document": {
                                        "anyOf": [_ref("ConfigDocument"), {"type": "null"}]
                                    },
                                    "changed_at": {"type": "string", "format": "date-time"},
                                },
                            },
                        },
                    },
                },
            },
        },
    }
