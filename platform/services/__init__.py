"""Control-plane services: the operations the API, CLI and jobs share (DB + object storage)."""
