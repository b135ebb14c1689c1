"""kodeagent: ReAct and CodeAct agents whose code runs in `sandboxes`."""
