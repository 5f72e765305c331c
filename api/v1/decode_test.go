package v1

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAnUnreadableSpecKeepsTheMetadataAndSaysWhy(t *testing.T) {
	var obj AIInference
	stored := `{"apiVersion":"serving.aiinference.io/v1","kind":"AIInference","metadata":{"name":"old","namespace":"ns","uid":"u1"},
		"spec":{"engine":"vLLM"},"status":{"phase":"Ready"}}`
	if err := json.Unmarshal([]byte(stored), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.Name != "old" || obj.Namespace != "ns" || obj.UID != "u1" || obj.Status.Phase != PhaseReady || obj.Kind != "AIInference" {
		t.Errorf("metadata or status lost: %+v", obj)
	}
	if !strings.Contains(obj.DecodeError(), "the stored spec cannot be read as serving.aiinference.io/v1") {
		t.Errorf("DecodeError %q", obj.DecodeError())
	}
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"new"},"spec":{"engine":{"type":"vLLM"}}}`), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.DecodeError() != "" || obj.Spec.Engine.Type != EngineVLLM {
		t.Errorf("a readable object after an unreadable one: %q %+v", obj.DecodeError(), obj.Spec.Engine)
	}
	if err := json.Unmarshal([]byte(`not json`), &obj); err == nil {
		t.Error("a document that is no object was read")
	}
	// The API machinery decodes case-sensitively: "Spec" is no spec.
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"x"},"Spec":{"replicas":3}}`), &obj); err != nil || obj.Spec.Replicas != nil {
		t.Errorf("case-insensitive read: %v %+v", err, obj.Spec.Replicas)
	}
}
