"""The elastic drain on the local Lambda service: a template, handlers, and watchers."""
