"""An accounting method's privacy maths: its keys, their checks, the noise for a target (epsilon, delta) and what it
spends, and what it records. Nothing else: what a grid trains and releases under it is its procedure's
(dpgrid.results.procedure), which `procedure` names as a dotted path, the way a config names its _target_ (the
maths import nothing of the files).

A method a user chooses is one config of conf/privacy/selection (its `_target_` this class, its `name`, its own keys,
typed by `Options` and checked by `check_options`); a method a strategy declares (`Strategy.accounting`) has no keys.
A method that only changes the maths (a stated noise multiplier, another accountant) subclasses one whose procedure
fits, and overrides `calibrate` alone.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Adjacency:
    """The neighbouring datasets an epsilon is for, and how the accountant's figures come to cover them.

    dpgrid states one relation everywhere, zero-out (Kairouz et al. 2021; Ponomareva et al. 2023, "How to DP-fy ML",
    section 5.1): D' is D with one training example replaced by a null example that contributes nothing to any sum or
    count. N is then the same in D and D', so N, B = qN and T are public, as dpgrid treats them. Under Poisson
    sampling at rate q the null example changes nothing a step computes: M(D') is distributed as M(D without the
    example) at the same q, so the pair (D, D') is exactly an add-or-remove pair, both ways, and the subsampled
    Gaussian's add-or-remove accounting (Opacus's RDP, dp-accounting's ADD_OR_REMOVE_ONE) is exactly its privacy under
    zero-out. (Replace-one with N public would cost far more: it is two such changes in one step.)"""
    name: str          # the relation stated
    words: str         # what model.json, `dpgrid plan`, `dpgrid model`, the tables' captions and the docs say
    public: str        # what the relation leaves public
    accounted_as: str  # the relation the accountant's figures are computed under, and why they cover `name`

    def to_dict(self) -> dict:
        return asdict(self)


ZERO_OUT_WORDS = ("zero-out: one training example replaced by a null example that contributes nothing to any sum or "
                  "count (N public)")
ZERO_OUT_PUBLIC = "N, B, q and T, the dataset's name and its test set"
ZERO_OUT = Adjacency("zero-out", ZERO_OUT_WORDS, ZERO_OUT_PUBLIC,
                     "add or remove one example at the same sampling rate q: with a null example a Poisson-sampled step "
                     "computes what it would without the example, so the two relations' privacy curves are one")


class AccountingMethod:
    @dataclass
    class Options:
        """Its own keys (privacy.selection.*), with their types: a misspelt key or a wrong type is refused."""

    Record = None  # a frozen dataclass: what plan.json records of it beside the common figures (calibrate returns one
                   # as `record`; plan.record holds it)

    name = ""
    accountants = ()  # the privacy.accountant values it takes
    # what its epsilon covers and what it does not, in the one wording model.json, selection.json, `dpgrid plan`,
    # `dpgrid model`, the tables' captions and the README use
    covers = ""
    adjacency = ZERO_OUT  # the neighbouring datasets its epsilon is for (an Adjacency: the one relation dpgrid states)
    accounts_seeds = False  # True: its epsilon always composes a configuration's seeds (privacy.account_seeds or not)
    # True: its calibration and every epsilon it records compose the plan's `statistics` (the Gaussian mechanisms a
    # model runs once on the private data before training, dpgrid.models.stages.PrivateStatistics); a grid whose model
    # has such statistics is refused under a method that does not say so
    composes_statistics = False
    procedure = "dpgrid.results.procedure.Procedure"  # what a grid trains and releases under it (composition's)
    # hooks of earlier releases, refused where a plugin still defines them (dpgrid.plugins.check_hooks)
    _renamed_hooks = {"plan": "rename it `calibrate(self, plan, strategy_cls, options, privacy, problem)`, which "
                             "returns the plan's fields (docs/extending.md, \"An accounting method\")"}

    @classmethod
    def check_options(cls, read) -> None:
        """Its keys' ranges and the settings it cannot run with; `read`: a dpgrid.plugins.Reader of the whole
        config (its keys are privacy.selection.*). DpgridError, one line naming the key, for a bad one."""

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        """The plan's fields this method fills in: the noise, its split among the strategy's queries, what it spends
        and its `record`. `plan` holds the public figures (N, B, q, T, K, seeds, the target, the accountant, the
        sampling); `privacy` the privacy settings and its own keys; `problem` a strategy's public constants."""
        raise NotImplementedError

    @staticmethod
    def released_steps(plan):
        """[[sample rate, noise multiplier, steps], ...]: the Poisson-subsampled Gaussian steps whose composition is
        exactly what covers a release (its epsilon_with_seeds), or None where it is not such a composition (the
        default). A model fine-tuned from the release composes them with its own (dpgrid.privacy.provenance)."""
        return None
