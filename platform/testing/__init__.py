"""Random-weight models and adapters of the real architectures, built offline, shared by the
test suite and the benchmarks (`models`, `adapters`). Needs the test extra (`transformers`,
`peft`); nothing here is used when serving."""
