"""Watch a run as it happens: output events as the code writes them, then the result.

python examples/streaming.py
"""

import time

from sandboxes import OutputEvent, ResultEvent, open_executor_sync

CODE = """
import time
for i in range(3):
    print("step", i, flush=True)
    time.sleep(0.2)
"""


def main() -> None:
    with open_executor_sync("host", timeout=10) as ex:
        start = time.monotonic()
        for event in ex.stream(CODE):
            if isinstance(event, OutputEvent):
                print(f"{time.monotonic() - start:5.2f} s  {event.stream}: {event.text!r}")
            elif isinstance(event, ResultEvent):
                print(f"{time.monotonic() - start:5.2f} s  result: ok={event.result.ok}")


if __name__ == "__main__":
    main()
