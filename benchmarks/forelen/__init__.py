"""ForeLen-style length benchmark: real prompts, output lengths from the serving model itself."""
