"""One exception family for bad user input (cluster files, plans, flags, model configs).

Every error names *where* (file and field path) and *what to do*, so the CLI can print one line
instead of a traceback.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Invalid user input. ``path`` is a dotted/indexed field path such as ``nodes[2].gpu``."""

    def __init__(self, path: str, message: str, hint: str = "", file: str | None = None,
                 line: int | None = None):
        self.path = path
        self.message = message
        self.hint = hint
        self.file = file
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        """One line of printable text: ``FILE:LINE: FIELD: MESSAGE (hint: HINT)``; a message about a
        whole file leaves out the field. Line breaks (a parser's message may hold some) become
        spaces, and other control characters (a file name may hold any) are escaped, so nothing in
        a name can move the cursor, erase what was printed or split the line."""
        where = f"{self.file}{f':{self.line}' if self.line else ''}: " if self.file else ""
        field = self.path or ("" if self.file else "<root>")
        text = f"{where}{field}: {self.message}" if field else f"{where}{self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(text.splitlines()))

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str, str, str | None, int | None]]:
        """Pickles whole (ranks exchange errors through collectives, ``data prep`` workers return them)."""
        return type(self), (self.path, self.message, self.hint, self.file, self.line)

    def with_file(self, file: str, line: int | None = None) -> SpecError:
        """The same error, annotated with the file (and line) it came from. An error that already
        names its file keeps it: a bad device profile met while a cluster file is read is the
        profile's fault, not the cluster file's."""
        if self.file is not None:
            return self
        return type(self)(self.path, self.message, self.hint, file, line or self.line)


class PlanInfeasible(SpecError):
    """A plan or planning request that cannot fit the cluster (memory, device count)."""
