"""Looking inside models: parameter, memory and compute budgets; attention analysis."""
