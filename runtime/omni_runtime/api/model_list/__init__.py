"""GET /v1/models: the model this worker serves, with an honest model card."""
