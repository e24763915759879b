"""The parallel scheme value object: `<TP, PP, CP>` of one pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class ParallelScheme:
    """Tensor, pipeline and context parallel degrees of one pipeline (one model replica).

    Validated on construction; a pipeline running this scheme uses `num_gpus` GPUs laid out
    with TP innermost, then CP, then PP (stage-major).
    """

    tp: int
    pp: int
    cp: int = 1

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "cp"):
            degree = getattr(self, axis)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise ValueError(f"{axis} must be a positive integer, got {degree!r}")

    @property
    def num_gpus(self) -> int:
        """GPUs used by one pipeline with this scheme."""
        return self.tp * self.pp * self.cp

    @property
    def gpus_per_stage(self) -> int:
        """GPUs holding one PP stage (a TP x CP grid)."""
        return self.tp * self.cp

    def __str__(self) -> str:
        return f"<{self.tp},{self.pp},{self.cp}>"

    @classmethod
    def parse(cls, text: str) -> ParallelScheme:
        """Parse `<tp,pp,cp>` or `tp,pp,cp` (cp optional)."""
        body = text.strip().removeprefix("<").removesuffix(">")
        try:
            parts = [int(part) for part in body.split(",")]
        except ValueError:
            raise ValueError(f"scheme {text!r} is not of the form <tp,pp,cp>") from None
        if len(parts) not in (2, 3):
            raise ValueError(f"scheme {text!r} is not of the form <tp,pp,cp>")
        return cls(*parts)
