"""The OpenAI-compatible inference gateway: request schemas, model resolution, rate limits,
replica routing, streaming and usage metering. The web layer (`loraplex.api.routes.openai`)
wires these together; nothing here imports `loraplex.api`."""
