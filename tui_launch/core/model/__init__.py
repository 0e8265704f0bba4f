"""The pure model of a run: events, the store and its views, errors, text."""
