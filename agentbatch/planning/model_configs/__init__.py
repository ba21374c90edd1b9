"""Preset model configs (Hugging Face config.json files) for `agentbatch plan --model NAME`.

Package data only: each `NAME.json` is a config.json; keys starting with `_` are agentbatch notes
saying where the fields came from (loaders ignore them).
"""
