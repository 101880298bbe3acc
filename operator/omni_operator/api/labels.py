"""Label and annotation keys shared by selectors, renderers, watchers and the router."""

from __future__ import annotations

PREFIX = "omni.dev"

DEPLOYMENT = f"{PREFIX}/deployment"
WORKER = f"{PREFIX}/worker"
ROLE = f"{PREFIX}/role"  # stage pod role: api, thinker, talker, image-encoder, router
STAGES = f"{PREFIX}/stages"  # annotation: comma list of the stages a pod hosts
REVISION = f"{PREFIX}/revision"
# annotation: hash of one stage pod's template (a change replaces only that role)
POD_REVISION = f"{PREFIX}/pod-revision"
COMPONENT = f"{PREFIX}/component"  # worker | router
RANK = f"{PREFIX}/node-rank"  # multi-node thinker: 0 is the leader

API_URL = f"{PREFIX}/api-url"  # annotation on a worker's Service: base URL of its OpenAI API
WORKER_STATE = f"{PREFIX}/worker-state"  # annotation on a worker's Service: starting|ready|draining
DRAIN_STARTED = f"{PREFIX}/drain-started"  # annotation: RFC 3339 time the drain began

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "omni-operator"
APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
APP_COMPONENT = "app.kubernetes.io/component"
APP_NAME_VALUE = "omni"

FIELD_MANAGER = "omni-operator"
FINALIZER = f"{PREFIX}/drain"
