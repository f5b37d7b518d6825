"""What forest-report computes and draws: importances, predictions, analyses, the HTML page."""
