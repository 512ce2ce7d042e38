"""What ``storm run`` writes to the terminal of a job's streamed output: pure, so it is unit tested.

Chunks (``job_output``, mm/protocol/output.py) come per rank and stream in order, but some may be missing:
every hop drops what its next one cannot take rather than hold up the ranks. A chunk's offset shows the gap,
and the end of each stream (never dropped) its length, so :class:`Assembler` counts what the terminal missed.
A requeued job's next run starts its streams again (sequence 0): they are written as new ones.
With ``label`` (as ``srun --label``) each complete line is prefixed by its rank, ``0: text``; a partial line
waits for its end (or for the stream's end, or a gap, when it is written as a line of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storm.mm.protocol import JobOutput

Key = tuple[int, str]  # (rank, stream)


@dataclass
class Assembler:
    """The streams of one job's output as they reach the client. Each call returns what to write now, as
    (stream, bytes) pairs: stream "out" goes to stdout, "err" to stderr."""

    label: bool = False
    expected: dict[Key, int] = field(default_factory=dict)  # the next offset due, per stream
    partial: dict[Key, bytes] = field(default_factory=dict)  # a labelled stream's unfinished line
    ended: set[Key] = field(default_factory=set)
    missed: int = 0  # bytes the terminal did not get (gaps and truncated ends)
    received: int = 0  # bytes of data taken (what the client acknowledges)

    def chunk(self, msg: JobOutput) -> list[tuple[str, bytes]]:
        key = (msg.rank, msg.stream)
        self.received += len(msg.data)
        out: list[tuple[str, bytes]] = []
        if msg.seq == 0 and (key in self.ended or key in self.expected):
            # Nothing is ever sent twice: a first chunk again is a new run of a requeued job.
            out.extend(self._flush(key))
            self.ended.discard(key)
            self.expected.pop(key, None)
        if key in self.ended:
            return []  # a repeat after the end (a reattachment): it was written already
        due = self.expected.get(key, 0)
        data = msg.data
        if msg.offset > due:
            self.missed += msg.offset - due
            out.extend(self._flush(key))  # the line was cut: what came of it stands alone
        elif msg.offset < due:
            data = data[due - msg.offset :]  # already written
        self.expected[key] = max(due, msg.offset + len(msg.data))
        if msg.eof:
            self.ended.add(key)
            out.extend(self._flush(key))
            return out
        if data:
            out.extend(self._lines(key, data) if self.label else [(msg.stream, data)])
        return out

    def _lines(self, key: Key, data: bytes) -> list[tuple[str, bytes]]:
        text = self.partial.pop(key, b"") + data
        cut = text.rfind(b"\n") + 1
        if cut < len(text):
            self.partial[key] = text[cut:]
        if not cut:
            return []
        prefix = f"{key[0]}: ".encode()
        lines = text[:cut].splitlines(keepends=True)
        return [(key[1], b"".join(prefix + line for line in lines))]

    def _flush(self, key: Key) -> list[tuple[str, bytes]]:
        rest = self.partial.pop(key, b"")
        return [(key[1], f"{key[0]}: ".encode() + rest + b"\n")] if rest else []

    def finish(self) -> list[tuple[str, bytes]]:
        """The job has ended: what is left of unfinished lines."""
        out: list[tuple[str, bytes]] = []
        for key in sorted(self.partial):
            out.extend(self._flush(key))
        return out
