package aiinference

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

func withAdapters(obj *servingv1.AIInference, names ...string) *servingv1.AIInference {
	obj.Spec.Adapters = nil
	for _, n := range names {
		obj.Spec.Adapters = append(obj.Spec.Adapters, servingv1.AdapterSpec{Name: n,
			Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "adapters", Prefix: n + "/"}}})
	}
	return obj
}

func deploymentOf(t *testing.T, obj *servingv1.AIInference) (*corev1.PodSpec, string) {
	t.Helper()
	d, err := DesiredDeployment(obj, Options{LoaderImage: "loader:dev"})
	if err != nil {
		t.Fatal(err)
	}
	return &d.Spec.Template.Spec, podTemplateHash(d)
}

// On vLLM a change of adapters rolls no pod: the template says only that
// there are adapters (the agent, --enable-lora, runtime updating); the set is
// the ConfigMap's adapters.json.
func TestVLLMAdaptersChangeNoPodTemplate(t *testing.T) {
	g := NewWithT(t)
	spec, one := deploymentOf(t, withAdapters(sampleInference(), "sql"))
	_, two := deploymentOf(t, withAdapters(sampleInference(), "sql", "chat"))
	_, none := deploymentOf(t, sampleInference())
	g.Expect(two).To(Equal(one), "adding an adapter must not change the pod template")
	g.Expect(none).NotTo(Equal(one), "the first adapter turns LoRA on, which is a restart")

	g.Expect(spec.InitContainers).To(HaveLen(3)) // loader, agent, warm-up gate
	agent := spec.InitContainers[1]
	g.Expect(agent.Name).To(Equal(servingv1.AdapterAgentContainerName))
	g.Expect(agent.RestartPolicy).NotTo(BeNil())
	g.Expect(agent.ReadinessProbe.HTTPGet.Path).To(Equal(loadspec.AdapterReadyPath))
	g.Expect(agent.Args).To(ContainElements("adapters", "http://127.0.0.1:8000"))
	engineC := spec.Containers[0]
	g.Expect(engineC.Args).To(ContainElement("--enable-lora"))
	g.Expect(engineC.Env).To(ContainElement(corev1.EnvVar{Name: "VLLM_ALLOW_RUNTIME_LORA_UPDATING", Value: "True"}))

	obj := withAdapters(sampleInference(), "sql", "chat")
	cm, err := desiredConfigMap(obj, "{}", loadspec.Budget{})
	g.Expect(err).NotTo(HaveOccurred())
	var set loadspec.AdapterSet
	g.Expect(json.Unmarshal([]byte(cm.Data[loadspec.AdaptersFileName]), &set)).To(Succeed())
	g.Expect(set.Adapters).To(HaveLen(2))
	g.Expect(set.Adapters[0].Load.Dest).To(HavePrefix("/models/.adapters/sql-"))
	g.Expect(set.Revision).To(Equal(adapterSet(obj).Revision))
	g.Expect(loaderConfig(obj).Adapters).To(BeEmpty(), "vLLM's loader does not fetch adapters at start: the agent does")
}

// TGI takes adapters at start: the loader fetches them after the model, the
// engine gets them in LORA_ADAPTERS, and a change rolls the pods.
func TestTGIAdaptersAreAStartChange(t *testing.T) {
	g := NewWithT(t)
	tgi := func(names ...string) *servingv1.AIInference {
		obj := withAdapters(sampleInference(), names...)
		obj.Spec.Engine.Type = servingv1.EngineTGI
		return obj
	}
	spec, one := deploymentOf(t, tgi("sql"))
	_, two := deploymentOf(t, tgi("sql", "chat"))
	g.Expect(two).NotTo(Equal(one))
	for _, c := range spec.InitContainers {
		g.Expect(c.Name).NotTo(Equal(servingv1.AdapterAgentContainerName))
	}
	var lora string
	for _, e := range spec.Containers[0].Env {
		if e.Name == "LORA_ADAPTERS" {
			lora = e.Value
		}
	}
	g.Expect(lora).To(MatchRegexp(`^sql=/models/\.adapters/sql-[0-9a-f]{12}$`))
	cfg := loaderConfig(tgi("sql", "chat"))
	g.Expect(cfg.Adapters).To(HaveLen(2))
	g.Expect(cfg.Adapters[1].Load.Source).To(Equal("s3://adapters/chat/"))
	cm, err := desiredConfigMap(tgi("sql"), "{}", loadspec.Budget{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.Data).NotTo(HaveKey(loadspec.AdaptersFileName))
}

// The model's keys go only to an adapter that names the model's Secret; a
// new revision is a new folder.
func TestAdapterCredentialsAndFolders(t *testing.T) {
	g := NewWithT(t)
	obj := withAdapters(sampleInference(), "a", "b")
	ref := &servingv1.S3CredentialsSecretRef{Name: "store"}
	obj.Spec.Model.Source.S3.CredentialsSecretRef = ref
	obj.Spec.Adapters[0].Source.S3.CredentialsSecretRef = ref.DeepCopy()
	g.Expect(adapterConfig(obj, obj.Spec.Adapters[0]).Anonymous).To(BeFalse())
	g.Expect(adapterConfig(obj, obj.Spec.Adapters[1]).Anonymous).To(BeTrue())
	before := adapterDir(obj.Spec.Adapters[0])
	obj.Spec.Adapters[0].Revision = "v2"
	g.Expect(adapterDir(obj.Spec.Adapters[0])).NotTo(Equal(before))
	obj.Spec.Adapters[0].Name = "../../etc"
	g.Expect(adapterDir(obj.Spec.Adapters[0])).To(HavePrefix("/models/.adapters/.._.._etc-"), "a name never leaves the adapter folder")

	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	g.Expect(adapterConfig(obj, obj.Spec.Adapters[1]).Fsync).To(BeTrue(), "adapters on the node's cache are flushed like the model")
	g.Expect(modelPath(obj)).To(Equal(cacheMountPath), "on the node cache the adapters sit inside the model's copy")
}

func servingPod(name string, current bool) podView {
	return podView{Name: name, Current: current, Serves: true, AdapterAgent: true, IP: "10.0.0.1"}
}

func TestAdapterStatusFromTheAgentsReports(t *testing.T) {
	now := time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC)
	obj := withAdapters(sampleInference(), "sql", "chat")
	rev := adapterSet(obj).Revision
	report := func(rev string, states ...loadspec.AdapterReplica) loadspec.AdapterReport {
		return loadspec.AdapterReport{Revision: rev, Adapters: states}
	}
	loaded := func(n string) loadspec.AdapterReplica {
		return loadspec.AdapterReplica{Name: n, State: string(servingv1.AdapterLoaded)}
	}
	tests := []struct {
		name    string
		pods    []podView
		reports map[string]loadspec.AdapterReport
		reason  string
		serving map[string]int32
		failure string
	}{
		{"every replica serves every adapter", []podView{servingPod("p1", true), servingPod("p2", false)},
			map[string]loadspec.AdapterReport{"p1": report(rev, loaded("sql"), loaded("chat")), "p2": report(rev, loaded("sql"), loaded("chat"))},
			servingv1.ReasonAdaptersLoaded, map[string]int32{"sql": 2, "chat": 2}, ""},
		{"a replica still fetching", []podView{servingPod("p1", true), servingPod("p2", true)},
			map[string]loadspec.AdapterReport{"p1": report(rev, loaded("sql"), loaded("chat")),
				"p2": report(rev, loaded("sql"), loadspec.AdapterReplica{Name: "chat", State: string(servingv1.AdapterFetching)})},
			servingv1.ReasonAdaptersLoading, map[string]int32{"sql": 2, "chat": 1}, ""},
		{"an agent on an older set counts for nothing yet", []podView{servingPod("p1", true)},
			map[string]loadspec.AdapterReport{"p1": report("old", loaded("sql"), loaded("chat"))},
			servingv1.ReasonAdaptersLoading, map[string]int32{"sql": 0, "chat": 0}, ""},
		{"a failed adapter names the pod and keeps the replica", []podView{servingPod("p1", true)},
			map[string]loadspec.AdapterReport{"p1": report(rev, loaded("sql"), loadspec.AdapterReplica{Name: "chat", State: string(servingv1.AdapterFailed), Attempts: 2, Retrying: true,
				Failure: &loadspec.Failure{Reason: loadspec.ReasonNotFound, Message: "no object under s3://adapters/chat/"}, FailedAt: now})},
			servingv1.ReasonAdapterFailed, map[string]int32{"sql": 1, "chat": 0}, loadspec.ReasonNotFound},
		{"a pod that does not serve is not counted", []podView{{Name: "p1", AdapterAgent: true}},
			map[string]loadspec.AdapterReport{"p1": report(rev, loaded("sql"), loaded("chat"))},
			servingv1.ReasonAdaptersLoading, map[string]int32{"sql": 0, "chat": 0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			st := &servingv1.AIInferenceStatus{}
			setAdapterStatus(st, obj, observation{podsSeen: true, pods: tt.pods, adapters: &adapterView{reports: tt.reports}}, now)
			c := meta.FindStatusCondition(st.Conditions, servingv1.ConditionAdaptersReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(tt.reason), c.Message)
			g.Expect(c.Status).To(Equal(map[bool]metav1.ConditionStatus{true: metav1.ConditionTrue, false: metav1.ConditionFalse}[tt.reason == servingv1.ReasonAdaptersLoaded]))
			for _, a := range st.Adapters {
				g.Expect(a.ServingReplicas).To(Equal(tt.serving[a.Name]), a.Name)
			}
			if tt.failure != "" {
				g.Expect(st.Adapters[1].LastFailure.Reason).To(Equal(tt.failure))
				g.Expect(c.Message).To(And(ContainSubstring("p1"), ContainSubstring("retried"), ContainSubstring("keeps serving")))
			}
		})
	}
}

func TestTGIAdapterStatusSaysTheRollout(t *testing.T) {
	g := NewWithT(t)
	obj := withAdapters(sampleInference(), "sql")
	obj.Spec.Engine.Type = servingv1.EngineTGI
	st := &servingv1.AIInferenceStatus{}
	setAdapterStatus(st, obj, observation{podsSeen: true, pods: []podView{servingPod("new", true), servingPod("old", false)}}, time.Now())
	c := meta.FindStatusCondition(st.Conditions, servingv1.ConditionAdaptersReady)
	g.Expect(c.Reason).To(Equal(servingv1.ReasonAdaptersRollingOut))
	g.Expect(c.Message).To(ContainSubstring("1 of 2 serving replicas"))
	g.Expect(st.Adapters[0].Pods).To(Equal([]string{"new"}))

	obj.Spec.Adapters = nil
	setAdapterStatus(st, obj, observation{podsSeen: true}, time.Now())
	g.Expect(st.Adapters).To(BeNil())
	g.Expect(meta.FindStatusCondition(st.Conditions, servingv1.ConditionAdaptersReady)).To(BeNil())
}

func TestEngineAdapterLoading(t *testing.T) {
	for typ, want := range map[servingv1.EngineType]engine.AdapterLoading{
		servingv1.EngineVLLM: engine.AdaptersAtRunTime, servingv1.EngineTGI: engine.AdaptersAtStart, servingv1.EngineTriton: engine.AdaptersUnsupported,
	} {
		eng, _ := engine.For(typ)
		if got := eng.AdapterLoading(); got != want {
			t.Errorf("%s: AdapterLoading %v, want %v", typ, got, want)
		}
		if typ == servingv1.EngineTriton && len(eng.Env(engine.Params{Adapters: []engine.Adapter{{Name: "a", Path: "/p"}}})) != 0 {
			t.Errorf("Triton got adapter environment")
		}
	}
	one, two := adapterToken(&servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{UID: "u1"}}), adapterToken(&servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{UID: "u2"}})
	if one == two || len(one) != 64 || strings.Contains(one, "u1") {
		t.Errorf("agent tokens %q and %q: want one per object, not showing the UID", one, two)
	}
}
