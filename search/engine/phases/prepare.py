"""The run's profile, measured now or as a resumed run stored it, and what is made from it."""

from __future__ import annotations

from env.cost.headroom import nothing_to_save
from env.data.model_profile import ModelProfile
from search.engine.evaluator_pool import EvaluatorPool
from search.engine.ledger import SearchSetup
from search.records import meta
from search.records.store import RunStore


def prepare(store: RunStore, pool: EvaluatorPool) -> SearchSetup:
    """The profile (from the store, else measured on the first Evaluator and stored) and the
    ``SearchSetup`` made from it, before any loop exists; the store gets the units and their choice."""
    store.write(meta.EVALUATORS, pool.describe())
    store.write(meta.FSDP, pool.slots[0].info.get("fsdp"))  # None: one device a measurement
    if store.read(meta.UNIT_CHOICE) is None:
        store.write(meta.UNIT_CHOICE, pool.slots[0].info["unit_choice"])
    profile = store.read(meta.PROFILE)
    if profile is None:
        units, actions = pool.slots[0].info["units"], pool.cfg.actions
        seconds = pool.deadlines.profile(len(units), len(actions))
        profile = ModelProfile.model_validate(pool.get(pool.first.profile.remote(), seconds,
                                                       f"{pool.live[0].name}: the profile of the decision units",
                                                       pool.live[0]))
        store.write(meta.PROFILE, profile)
    setup = SearchSetup.from_profile(profile)
    store.write(meta.HEADROOM, nothing_to_save(setup.profile))  # None, or why no plan can save much
    store.write(meta.UNITS, setup.profile.units)
    store.write(meta.FINGERPRINT, setup.profile.fingerprint)
    return setup
