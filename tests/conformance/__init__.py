"""One module per contract (run, stream, fork, usage, files, tools), each run over every backend."""
