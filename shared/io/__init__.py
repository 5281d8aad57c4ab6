"""Files: JSON-lines datasets read with errors that name the line (jsonl), and version trees hard-linked
where they can be (linktree)."""
