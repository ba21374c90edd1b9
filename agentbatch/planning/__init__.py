"""Capacity planning: model shapes, the hybrid resource model, reference concurrency, engine flags."""
