"""The one exception type the CLI turns into a single clear error line and a non-zero exit (loading failures are
turned into it by `hf_ext.loading`), and what an error line may show of user input and secrets."""

import re
import reprlib


class HfExtError(Exception):
    """A user-facing failure: bad input, a refused checkpoint, a bad argument. The message is one line."""


def one_line(error: BaseException) -> str:
    """An exception's message as one line: its first two lines joined (transformers' strict config checks put the
    detail on the second), or its type name when it has no message."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__


MAX_QUOTED_CHARS = 60  # of a user value quoted in an error message
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, MAX_QUOTED_CHARS, MAX_QUOTED_CHARS
# a Hub token (hf_ and 34 letters; the length keeps names such as hf_ext out), an Authorization header's value
SECRET = re.compile(r"(?<![A-Za-z0-9])(hf_)[A-Za-z0-9]{10,}|(Bearer\s+)[^\s'\"]+")
REMOTE_CODE_REFUSED = re.compile(r"The repository (.+?) (?:contains|references) custom code")


def quoted(value: object) -> str:
    """`repr(value)` for an error message, cut to `MAX_QUOTED_CHARS` characters: a line that quotes user input stays
    short whatever the input, and building it costs little (reprlib shows a few items of each container and a few
    levels, so a structure that YAML aliases make enormous is never expanded)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS - 3] + "..."


def redact(message: str) -> str:
    """`message` with every Hub token (`hf_...`) and Authorization value (`Bearer ...`) in it replaced by `***`: an
    error line may quote a request that carried one (an HTTP library refusing a header, an echoed argument)."""
    return SECRET.sub(lambda match: f"{match.group(1) or match.group(2)}***", message)


def remote_code_refusal(error: BaseException) -> str | None:
    """The error line for transformers refusing to run a model's own code (`trust_remote_code=False`), wherever in
    `error`'s chain it is (a loader may have turned it into another error), or None. hf-ext never lets transformers
    ask instead: its y/N prompt reads standard input, which a pipe can answer."""
    seen = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, ValueError) and "trust_remote_code=True" in str(link):
            match = REMOTE_CODE_REFUSED.search(str(link))
            name = match.group(1) if match else "the model"
            return (f"{name} needs its own model code, which hf-ext runs only with --trust-remote-code (read that "
                    "code first)")
        link = link.__cause__ or link.__context__
    return None


def require(condition: object, message: str) -> None:
    """Raise `HfExtError(message)` unless `condition` holds: a check of input that argparse's `type=` validators
    (`hf_ext.arguments`) cannot make alone, such as one option against another or against the model."""
    if not condition:
        raise HfExtError(message)
