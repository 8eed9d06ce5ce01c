"""An audit's outcome in words: its summary line (the lower bound, against the claim) and its verdict (whether the
claim and the mechanism stand; the audit's exit status follows it)."""


def summary_line(record: dict) -> str:
    claimed = f"epsilon = {record['epsilon_claimed']:.4g}" if record["epsilon_claimed"] is not None else "no epsilon"
    return (f"audit ({record['threat_model'].replace('_', '-')}, {record['canaries']} canaries, "
            f"{len(record['released_runs'])} released of {record['runs']} runs): epsilon >= "
            f"{record['epsilon_lower_bound']:.3g} at {record['confidence']:.0%} confidence ({record['correct']} of "
            f"{record['guesses']} guesses right; Gaussian f-DP estimate {record['epsilon_fdp']['epsilon_lower_bound']:.3g}); "
            f"claimed {claimed}, delta = {record['delta']:g}")


def verdict_line(record: dict) -> str:
    """In words, whether the claim and the mechanism stand (the audit's exit status follows it)."""
    claimed, bound = record["epsilon_claimed"], record["epsilon_lower_bound"]
    confidence = f"{record['confidence']:.0%} confidence"
    if claimed is None:
        claim = "no epsilon is claimed, so none is tested"
    elif bound > claimed:
        claim = (f"the claim does NOT stand: the lower bound {bound:.3g} exceeds the claimed epsilon {claimed:.4g} at "
                 f"{confidence}")
    else:
        claim = (f"the claim stands: the lower bound {bound:.3g} does not exceed the claimed epsilon {claimed:.4g} (one "
                 "attack's evidence, not a proof of the claim)")
    mechanism = record["mechanism"]
    if mechanism is None:
        works = "the mechanism was not tested (only the white box tests it: --threat white_box)"
    elif mechanism.get("verdict") == "differs":
        works = f"the mechanism does NOT stand: it differs from the plan at {confidence} (the line above says where)"
    else:
        works = "the mechanism stands: what was measured of it is as planned"
    failed = (claimed is not None and bound > claimed) or (mechanism or {}).get("verdict") == "differs"
    return f"verdict: {claim}; {works}" + (" (exit 1)" if failed else "")
