"""Built-in plugins. Every public module here is registered exactly like a third-party plugin."""
