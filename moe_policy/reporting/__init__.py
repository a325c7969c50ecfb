"""What a decision leaves behind: structured events, warnings and the JSON-lines audit."""
