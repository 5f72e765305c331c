package webhook_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/webhook"
)

// Without a cluster: every case the webhook (rather than the schema) refuses is
// refused by the validators with the promised words, and the valid objects pass.
func TestValidatorsRefuseTheInvalidCases(t *testing.T) {
	cases := invalidCases()
	if n := len(cases); n < 30 {
		t.Fatalf("only %d invalid cases; the issue asks for at least 30", n)
	}
	for _, tc := range cases {
		if tc.schema {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			var err error
			switch obj := tc.obj.(type) {
			case *servingv1.AIInference:
				_, err = webhook.ValidatorV1{}.ValidateCreate(context.Background(), obj)
			case *servingv1alpha1.AIInference:
				_, err = webhook.ValidatorV1Alpha1{}.ValidateCreate(context.Background(), obj)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message lacks %q:\n%s", want, err)
				}
			}
		})
	}
	for _, obj := range []*servingv1.AIInference{validV1(nil), withArgs(servingv1.EngineVLLM, "--max-model-len=8192", "--portable")} {
		if w, err := (webhook.ValidatorV1{}).ValidateCreate(context.Background(), obj); err != nil || len(w) > 0 {
			t.Errorf("valid v1 object refused: %v, warnings %v", err, w)
		}
	}
	if w, err := (webhook.ValidatorV1Alpha1{}).ValidateCreate(context.Background(), validV1Alpha1(nil)); err != nil || len(w) > 0 {
		t.Errorf("valid v1alpha1 object refused: %v, warnings %v", err, w)
	}
}

func TestUnknownGPUProductIsOnlyAWarning(t *testing.T) {
	obj := validV1(func(o *servingv1.AIInference) { o.Spec.GPU.Products = []string{"NVIDIA-L4", "NVIDIA-H100-80GB-HMB3"} })
	w, err := webhook.ValidatorV1{}.ValidateCreate(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 1 || !strings.Contains(w[0], `"NVIDIA-H100-80GB-HMB3" is not a GPU product the operator knows`) || !strings.Contains(w[0], "check the spelling") {
		t.Fatalf("warnings %q", w)
	}
}

// Every flag an engine gets from the operator is one users may not pass again.
func TestEveryFlagTheOperatorSetsIsRefused(t *testing.T) {
	for _, typ := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton} {
		eng, err := engine.For(typ)
		if err != nil {
			t.Fatal(err)
		}
		for _, arg := range eng.Args(engine.Params{ModelPath: "/models/m", ServedName: "m", Port: 8000, TensorParallel: 2, Nodes: 2}) {
			if !strings.HasPrefix(arg, "-") {
				continue
			}
			name, _, _ := strings.Cut(arg, "=")
			if _, err := (webhook.ValidatorV1{}).ValidateCreate(context.Background(), withArgs(typ, name+"=1")); err == nil {
				t.Errorf("%s: the operator sets %s but the webhook lets users set it too", typ, name)
			}
		}
	}
}

func TestDefaulterSetsTheEnginePort(t *testing.T) {
	for typ, port := range map[servingv1.EngineType]int32{servingv1.EngineVLLM: 8000, servingv1.EngineTGI: 8080, servingv1.EngineTriton: 8000} {
		obj := withArgs(typ)
		if err := (webhook.Defaulter{}).Default(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
		if obj.Spec.Engine.Port != port {
			t.Errorf("%s: port %d, want %d", typ, obj.Spec.Engine.Port, port)
		}
	}
	obj := validV1(func(o *servingv1.AIInference) { o.Spec.Engine.Port = 9000 })
	_ = (webhook.Defaulter{}).Default(context.Background(), obj)
	if obj.Spec.Engine.Port != 9000 {
		t.Errorf("a set port was changed to %d", obj.Spec.Engine.Port)
	}
}

// An update is refused only for problems it brings in: an object admitted before
// a rule existed stays editable.
func TestUpdatesAreRefusedOnlyForNewProblems(t *testing.T) {
	ctx := context.Background()
	old := withArgs(servingv1.EngineVLLM, "--port=9000")
	relabelled := old.DeepCopy()
	relabelled.Labels = map[string]string{"team": "ml"}
	if _, err := (webhook.ValidatorV1{}).ValidateUpdate(ctx, old, relabelled); err != nil {
		t.Errorf("a label change on an object with an old problem was refused: %v", err)
	}
	worse := relabelled.DeepCopy()
	worse.Spec.Engine.Env = []corev1.EnvVar{{Name: "CUDA_VISIBLE_DEVICES", Value: "0"}}
	_, err := (webhook.ValidatorV1{}).ValidateUpdate(ctx, old, worse)
	if err == nil || !strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES") || strings.Contains(err.Error(), "--port") {
		t.Errorf("want only the new problem reported, got %v", err)
	}

	oldAlpha := validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.EngineArgs = []string{"--port=1"} })
	newAlpha := oldAlpha.DeepCopy()
	newAlpha.Spec.Replicas = ptr.To[int32](2)
	if _, err := (webhook.ValidatorV1Alpha1{}).ValidateUpdate(ctx, oldAlpha, newAlpha); err != nil {
		t.Errorf("v1alpha1: a replica change on an object with an old problem was refused: %v", err)
	}
	newAlpha.Spec.EngineArgs = append(newAlpha.Spec.EngineArgs, "-tp", "2")
	if _, err := (webhook.ValidatorV1Alpha1{}).ValidateUpdate(ctx, oldAlpha, newAlpha); err == nil || !strings.Contains(err.Error(), `"-tp"`) {
		t.Errorf("v1alpha1: want the new -tp refused, got %v", err)
	}
}
