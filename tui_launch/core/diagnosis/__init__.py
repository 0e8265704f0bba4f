"""Stacks, dumps, hang watch and stragglers."""
