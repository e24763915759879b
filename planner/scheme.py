"""The parallel scheme value object: `<TP, PP, CP>` of one pipeline, `<TP, PP, CP, v>` when each
of its GPUs holds `v > 1` model chunks (Megatron-LM's interleaved 1F1B, Narayanan et al. 2021
§2.2.2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class ParallelScheme:
    """Tensor, pipeline and context parallel degrees of one pipeline (one model replica).

    Validated on construction; a pipeline running this scheme uses `num_gpus` GPUs laid out
    with TP innermost, then CP, then PP (stage-major). `v` is the number of model chunks (virtual
    stages) each PP rank holds: 1 is plain 1F1B, `v > 1` the interleaved schedule (needs pp > 1).
    """

    tp: int
    pp: int
    cp: int = 1
    v: int = 1

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "cp", "v"):
            degree = getattr(self, axis)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise ValueError(f"{axis} must be a positive integer, got {degree!r}")
        if self.v > 1 and self.pp == 1:
            raise ValueError(f"v {self.v} (interleaved 1F1B) needs pp > 1, got pp 1")

    @property
    def is_interleaved(self) -> bool:
        """True when each PP rank holds more than one model chunk."""
        return self.v > 1

    @property
    def num_virtual_stages(self) -> int:
        """Model chunks of the whole pipeline, `pp * v`."""
        return self.pp * self.v

    @property
    def key(self) -> tuple[int, ...]:
        """(tp, pp, cp), with v appended when v > 1 (the form profiles name a scheme by)."""
        return (self.tp, self.pp, self.cp) if self.v == 1 else (self.tp, self.pp, self.cp, self.v)

    def check_layers(self, num_layers: int) -> None:
        """Raise ValueError unless `num_layers` split evenly into pp stages (v > 1: into pp * v chunks)."""
        if self.v > 1 and num_layers % (self.pp * self.v):
            raise ValueError(
                f"scheme {self}: {num_layers} layers do not split into pp {self.pp} x v {self.v} equal chunks "
                f"(v must divide num_layers / pp)"
            )

    @property
    def plain(self) -> ParallelScheme:
        """The same `<tp,pp,cp>` with one chunk per rank."""
        return self if self.v == 1 else ParallelScheme(self.tp, self.pp, self.cp)

    @property
    def num_gpus(self) -> int:
        """GPUs used by one pipeline with this scheme."""
        return self.tp * self.pp * self.cp

    @property
    def gpus_per_stage(self) -> int:
        """GPUs holding one PP stage (a TP x CP grid)."""
        return self.tp * self.cp

    def __str__(self) -> str:
        if self.v > 1:
            return f"<{self.tp},{self.pp},{self.cp},{self.v}>"
        return f"<{self.tp},{self.pp},{self.cp}>"

    @classmethod
    def parse(cls, text: str) -> ParallelScheme:
        """Parse `<tp,pp,cp>`, `<tp,pp,cp,v>` or the same without brackets (cp and v optional)."""
        body = text.strip().removeprefix("<").removesuffix(">")
        try:
            parts = [int(part) for part in body.split(",")]
        except ValueError:
            raise ValueError(f"scheme {text!r} is not of the form <tp,pp,cp> or <tp,pp,cp,v>") from None
        if len(parts) not in (2, 3, 4):
            raise ValueError(f"scheme {text!r} is not of the form <tp,pp,cp> or <tp,pp,cp,v>")
        return cls(*parts)
