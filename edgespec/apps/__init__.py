"""What users run: the CLI, chat, the OpenAI-compatible server and fill-in-the-middle. Imports any layer below."""
