"""The torch seam: every private torch name the launcher uses."""
