"""PLACEHOLDER until its owner writes it."""


def register(sub):
    pass
