"""Tuning on a subsample (privacy.selection=subsample_tuning; Koskela & Kulkarni, NeurIPS 2023) as a grid's
accounting method: what it trains, in which order, and what it releases. Its bounds and calibration are
dpgrid.privacy.subsample_bounds'.

1. The tuning set X1: each training example joins it with probability q1 = privacy.selection.tuning_rate, drawn once from the
   grid's randomness (secure with privacy.secure_rng) and kept in tuning_set.json (private).
2. The tuning phase (rows: phase=tuning): the candidates train on X1 only — random stopping over the grid
   (privacy.selection.tuning_search=random_stopping, the default: candidates.json as a selection's) or every configuration
   (composition) — with the same q and T as the final model, the expected batch q1 B and the tuning noise nu_1.
3. The final phase (phase=final): the chosen configuration's clip and learning rate carried over unchanged, its
   `train.seeds` runs train on the full data (privacy.selection.final_data=full, the default) or on X \\ X1 (rest), with the
   final noise nu_2 and the expected batch B (or (1 - q1) B).

Released (selection.json, model/): the chosen configuration, its tuning score, the final model and its score, the
public accounting. Private: tuning_set.json, candidates.json, runs.csv, curves.csv, summary.csv.
"""

from dataclasses import dataclass
from typing import Any

from dpgrid import DpgridError
from dpgrid.privacy.method import AccountingMethod
from dpgrid.privacy.random_stopping import RandomStopping, check_stopping
from dpgrid.privacy.subsample_bounds import ANALYSES, COVERS, FINAL_DATA, SEARCHES, Setting, calibrate_phases



class SubsampleTuning(AccountingMethod):
    """The candidates train on X1 (phase=tuning), then the chosen configuration's seeds train on the full data or
    on X \\ X1 (phase=final); the final model is released with the chosen hyperparameters."""
    @dataclass
    class Options(RandomStopping.Options):  # its search's keys (random stopping's), then its own
        tuning_rate: float = 0.1
        tuning_search: str = "random_stopping"
        tuning_split: Any = "shared"
        final_data: str = "full"

    @dataclass(frozen=True)
    class Record(RandomStopping.Record):
        tuning: dict  # its rate, search and final data, both phases' noise, steps and epsilon

    name = "subsample_tuning"
    accounts_seeds = True  # a candidate is its seeds' runs composed
    accountants = ("rdp", "pld")
    covers = ("the chosen configuration and its tuning score, and the final runs' output: their trained models, "
              "learning curves and scores (selection.json, model/); not the tuning set, the other candidates nor how "
              "many there were (tuning_set.json, candidates.json, runs.csv, curves.csv, summary.csv, ledger.json and "
              "cli.log are the experimenter's private log)")
    procedure = "dpgrid.results.tuning.SubsampleTuningProcedure"

    @classmethod
    def check_options(cls, read) -> None:
        key = "privacy.selection."
        read.real(key + "tuning_rate", "a number in (0, 1) (each example joins the tuning set with this probability)",
                  lambda v: 0 < v < 1)
        read.choice(key + "tuning_search", SEARCHES)
        read.choice(key + "final_data", FINAL_DATA)
        split = read.get(key + "tuning_split")
        if split != "shared" and not (isinstance(split, (int, float)) and not isinstance(split, bool) and 0 < split < 1):
            read.refuse(key + "tuning_split", "shared (one noise multiplier for both phases) or a number in (0, 1) (the "
                        "share of epsilon the tuning phase alone may spend; 0 and 1 leave a phase no budget)", split)
        check_stopping(read, COVERS)  # no Liu-Talwar rule: its analysis is not amplified here

    def calibrate(self, plan, strategy_cls, options: dict, privacy: dict, problem: dict) -> dict:
        from dpgrid.privacy.random_stopping import parameters

        search = str(privacy.get("tuning_search") or "random_stopping")
        mean = float(privacy["stopping_mean"]) if privacy.get("stopping_mean") is not None else float(plan.n_configs)
        stopping = (parameters(str(privacy["stopping"]), float(privacy["stopping_eta"]), mean, plan.delta,
                               privacy.get("stopping_rounds")) if search == "random_stopping" else {})
        rate = float(privacy["tuning_rate"])
        final_data = str(privacy.get("final_data") or "full")
        split = privacy.get("tuning_split") if privacy.get("tuning_split") is not None else "shared"
        analysis = str(privacy.get("selection_accountant", "rdp"))
        setting = Setting(plan.sample_rate, plan.steps, plan.seeds, plan.n_configs, plan.delta, rate, search,
                          final_data, stopping)
        tuning_batch = rate * plan.batch_size
        if tuning_batch < 1:
            raise DpgridError(f"privacy.selection.tuning_rate={rate:g} leaves the candidates an expected batch of "
                              f"{tuning_batch:.3g} examples (q1 x train.batch_size) < 1: raise privacy.selection.tuning_rate "
                              "or train.batch_size")
        if final_data == "rest" and (1 - rate) * plan.batch_size < 1:
            raise DpgridError(f"privacy.selection.final_data=rest with privacy.selection.tuning_rate={rate:g} leaves the final "
                              f"model an expected batch of {(1 - rate) * plan.batch_size:.3g} examples ((1 - q1) x "
                              "train.batch_size) < 1 of the examples outside the tuning set: lower "
                              "privacy.selection.tuning_rate, or train the final model on final_data=full")
        nu_1, nu_2 = calibrate_phases(setting, plan.epsilon, split, analysis)
        try:
            tuning_queries = strategy_cls.split_noise(nu_1, options, tuning_batch)
        except DpgridError as e:  # a split that depends on the batch (fixed_quantile's count): the tuning set's
            raise DpgridError(f"the tuning phase (expected batch q1 B = {tuning_batch:.4g}): {e}; or raise "
                              "privacy.selection.tuning_rate") from None
        by_analysis = {name: spent(setting, nu_1, nu_2) for name, spent in ANALYSES.items()
                       if not stopping or stopping["rule"] in COVERS[name]}
        spent = by_analysis[analysis]
        final_batch = plan.batch_size * (1 if final_data == "full" else 1 - rate)
        runs = mean if search == "random_stopping" else plan.n_configs
        tuning = {"rate": rate, "search": search, "final_data": final_data,
                  "split": split if split == "shared" else float(split),
                  "tuning": {"noise_multiplier": nu_1, "per_query": tuning_queries,
                             "batch_size": tuning_batch, "steps": plan.steps, "epsilon": spent["tuning"],
                             "expected_runs": runs * plan.seeds},
                  "final": {"noise_multiplier": nu_2, "batch_size": final_batch, "steps": plan.steps,
                            "epsilon": spent["final"], "runs": plan.seeds},
                  "epsilon_by_analysis": {name: s["total"] for name, s in by_analysis.items()},
                  # compute in run-steps x expected batch, against the same search on the full data
                  "relative_compute": (rate * runs + 1) / runs}
        return dict(account_seeds=True, composed_runs=plan.seeds,
                    record=self.Record(stopping, analysis, tuning["epsilon_by_analysis"], tuning), noise_multiplier=nu_2,
                    per_query=strategy_cls.split_noise(nu_2, options, final_batch),
                    epsilon_spent=spent["total"], epsilon_grid=spent["total"], epsilon_with_seeds=spent["total"],
                    epsilon_per_run=spent["final"])
