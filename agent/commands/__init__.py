"""One module per `daop-agent` subcommand."""
