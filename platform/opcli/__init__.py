"""The operator CLI: `loraplex tenants|keys|adapters|deployments|demo`, clients of a running
API over HTTP (httpx), plus `loraplex demo adapter` which writes a PEFT adapter offline."""
