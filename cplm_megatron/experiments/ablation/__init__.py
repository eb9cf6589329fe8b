"""The baseline-vs-CPLM ablation: its runs (plan: corpus pairs and SpamLang at large vocabularies) and its report
(report: claims, tables, plots)."""
