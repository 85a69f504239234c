"""The control plane's PostgreSQL schema (SQLAlchemy 2 models), sessions and migrations."""
