"""Settings renamed since a release: the old spelling still sets the new key, with one warning naming it."""

import warnings

RENAMED_KEYS = {"train.conv_method": ("train.per_sample_method", "it chooses the per-sample form of every layer whose "
                                                                   "rule offers several, not only a convolution's")}


def renamed_keys(overrides: list) -> list:
    """The overrides with each renamed key (RENAMED_KEYS: {old key: (new key, why)}) written as it is now, and one
    warning for each."""
    rewritten = []
    for text in overrides:
        key, equals, value = text.partition("=")
        bare = key.lstrip("+~")
        if equals and bare in RENAMED_KEYS:
            new, why = RENAMED_KEYS[bare]
            warnings.warn(f"{bare} is now {new} ({why}); set {new}={value}")
            text = f"{key[:len(key) - len(bare)]}{new}={value}"
        rewritten.append(text)
    return rewritten


def as_written_now(overrides: list) -> list:
    """Overrides as the settings are spelt now: privacy.selection=NAME and a selection's privacy.KEY (as written
    before the selection was a config option, dpgrid.config.selection) and each renamed key."""
    from dpgrid.config.selection import selection_overrides

    return renamed_keys(selection_overrides(overrides))
