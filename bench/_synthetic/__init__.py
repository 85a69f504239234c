"""Synthetic inputs for the benchmarks and the test suite: random-weight models of the real
architectures (`models`), random PEFT adapters over them (`adapters`) and JSON schemas for
structured output (`json_schemas`), built offline. Part of `bench/` (never of the runtime
parts: import contract `bench-outside-runtime`); the leading underscore keeps it out of
`loraplex bench`'s list of benchmarks. Needs the test extra (`transformers`, `peft`)."""
