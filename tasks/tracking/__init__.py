"""Reporting runs to experiment trackers (MLflow): reads run folders, never trains."""
