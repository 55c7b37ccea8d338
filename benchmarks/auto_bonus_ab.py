"""``auto`` observing an n-gram block's whole proposal against the tokens it emitted (the bonus token after drafts all
accepted is a draw of the next proposed token's acceptance) against observing only the drafts the block tested (the
rule in ``auto``, under which the rate of the later tokens goes unseen while lookup/1 runs), beside ``ar`` and one
fixed mode: one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order
alternating), so all see the same machine state. Prints each pass's tokens/s and the ratio of the two variants.

    python benchmarks/auto_bonus_ab.py --pair smollm2 --slim benchmarks/results/smollm2_light.json --workload task \\
        --temperature 0.7 --prompts 6 --max-new-tokens 48 --passes 4 --fixed lookup@2
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding import modes
from dimr.decoding.auto import GAMMAS, Arm, _Decode, _lookup_seen
from dimr.decoding.proposer import lookup_match

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

TESTED = _Decode.block


def whole(self: _Decode, arm: Arm) -> list[modes.Observation]:
    if arm.mode != "lookup":
        return TESTED(self, arm)
    start = self.out.ids
    ahead = lookup_match(start, GAMMAS[-1])[0]  # the proposal the block's drafts are the first γ tokens of
    modes.sd_block(self.proposers["lookup"], self.full, self.out, arm.gamma, self.generator)
    return _lookup_seen(ahead, self.out.ids[start.numel():])


def use(rule: object) -> None:
    _Decode.block = rule


if __name__ == "__main__":
    rules_ab(__doc__, "task", 0.7, "lookup@2", {"whole": whole, "tested": TESTED}, use)
