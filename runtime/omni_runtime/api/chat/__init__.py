"""Chat completions: protocol models, media loading, serving class and route."""
