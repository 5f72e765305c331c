package nodecachespec

import (
	"strings"
	"testing"
)

func TestParseBudgetRefusesWhatHoldsNoModel(t *testing.T) {
	for budget, want := range map[string]string{
		"lots": "not a quantity of bytes",
		"-1Gi": "holds no model",
		"0":    "holds no model",
		"":     "not a quantity of bytes",
	} {
		if _, err := ParseBudget(budget); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBudget(%q) = %v, want an error saying %q", budget, err, want)
		}
	}
	q, err := ParseBudget("500Gi")
	if err != nil || q.Value() != 500<<30 {
		t.Errorf("ParseBudget(500Gi) = %v, %v", q.String(), err)
	}
}
