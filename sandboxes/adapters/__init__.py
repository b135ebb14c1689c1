"""Adapters: ways into the sandbox for tools other than kodeagent's own agents.

Each adapter is one module that imports its third-party package lazily (an optional extra), and none
is imported by `import sandboxes` or `import kodeagent`.
"""
