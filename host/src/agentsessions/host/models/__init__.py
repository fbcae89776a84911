"""Model providers: the embedded echo model and an OpenAI-compatible HTTP provider."""
