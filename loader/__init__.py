"""Fast model loading: stream safetensors from object storage to the device.

`object_store` (S3 client with retries), `safetensors_header` (header validation),
`range_plan` + `stream_reader` + `device_sink` (concurrent ranged GETs, tensor by tensor),
`checkpoint_index` (sharded checkpoints), `select` (expert-parallel tensor filters),
`quantize` (on-the-way-in quantization), `storage` (the loader's own storage config),
and `timeline` (cold-start metrics). Capturing the decode step as CUDA graphs is the engine's
(`loraplex.platform.engine.cuda_graphs`): the loader only brings the weights in.
"""
