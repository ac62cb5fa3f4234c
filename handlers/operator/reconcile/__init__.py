"""The reconciler of an env's real jobs and its pure decisions (planning, events), the
same on every platform; moved out of handlers/operator/kube/, which the local platform
drives it through as well."""
