"""Weights shipped with hookviz (data, not code): see `hookviz.zoo`."""
