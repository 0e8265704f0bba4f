"""Entry points: one module per subcommand, each with ``main(argv) -> int``."""
