"""A run killed mid-way, for resume tests: a progress callback that raises after an epoch."""


class Killed(Exception):
    """Stands for the process being killed (the checkpoint written so far stays)."""


def kill_after_epoch(epoch: int):
    """A `progress` callback for train(): raises Killed once epoch `epoch` has ended."""
    def progress(ev: dict) -> None:
        if ev["event"] == "epoch" and ev["epoch"] == epoch:
            raise Killed
    return progress
