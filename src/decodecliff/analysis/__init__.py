"""From raw result JSON to tidy tables, figures and the report (shared by notebooks/*)."""
