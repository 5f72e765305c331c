package loadspec

import "time"

// The adapter agent's contract. With an engine that loads LoRA adapters at run
// time (vLLM), every pod runs the adapter agent (`model-loader adapters`) beside
// the engine: it fetches each adapter of its set into the cache volume with the
// loader (verified and resumable like the model), asks the engine to load it,
// unloads the adapters that left the set, and reports where each stands. A pod
// starts from the set in the loader ConfigMap (AdaptersFileName, which is not
// part of the pod template, so a change rolls no pod); the operator then puts
// each new set to the running pods' agents (PUT AdaptersPath).
const (
	// AdaptersFileName is the ConfigMap key and file name of the adapter set.
	AdaptersFileName = "adapters.json"
	// AdaptersDir is the folder of the cache volume that holds the adapters,
	// one folder each (see AdapterSet).
	AdaptersDir = ".adapters"
	// AdapterAgentPort is the agent's HTTP port, named AdapterAgentPortName.
	AdapterAgentPort     = 8097
	AdapterAgentPortName = "adapters"
	// AdaptersPath answers the agent's Report (GET) and takes a new AdapterSet (PUT).
	AdaptersPath = "/adapters"
	// AdapterReadyPath answers 200 once every adapter of the set the pod
	// started with was tried once (loaded or failed): a new replica so comes up
	// with every adapter, and a failed adapter never keeps it out of service.
	AdapterReadyPath = "/ready"
	// AdapterTokenHeader carries the object's agent token on a PUT: only the
	// operator, which made the pod, changes what the pod fetches and loads.
	AdapterTokenHeader = "X-Adapter-Token"
	// EnvAdapterToken is the agent's environment variable holding the token.
	EnvAdapterToken = "ADAPTER_AGENT_TOKEN"
	// MaxAdapterSetBytes bounds a PUT's body and a report's size.
	MaxAdapterSetBytes = 1 << 20
)

// ReasonEngineRefused: the engine answered the load request with an error
// (files it cannot read, a rank above --max-lora-rank, LoRA not enabled).
const ReasonEngineRefused = "EngineRefused"

// AdapterSet is the adapters one pod is to serve.
type AdapterSet struct {
	// Revision names the set (a hash of it), so the operator can tell whether
	// a pod's agent has the current one.
	Revision string `json:"revision"`
	// MaxAttempts bounds the attempts per adapter (loading.maxRetries + 1);
	// Backoff is the wait after the first failure, doubled for each further
	// one up to MaxBackoff (loading.backoff).
	MaxAttempts int       `json:"maxAttempts"`
	Backoff     Duration  `json:"backoff"`
	Adapters    []Adapter `json:"adapters"`
}

// Adapter is one adapter to serve: its name and how to fetch its files.
type Adapter struct {
	// Name is the served name the engine loads it under.
	Name string `json:"name"`
	// Load is the loader's configuration for the adapter's files; Load.Dest is
	// a folder under the cache volume's AdaptersDir.
	Load Config `json:"load"`
}

// AdapterReport is what the agent answers: the set it works on and where each
// of its adapters stands in this pod.
type AdapterReport struct {
	Revision string           `json:"revision"`
	Adapters []AdapterReplica `json:"adapters"`
}

// AdapterReplica is one adapter in one pod.
type AdapterReplica struct {
	Name string `json:"name"`
	// State is Fetching, Loading, Loaded or Failed (servingv1.AdapterState).
	State string `json:"state"`
	// Path is the folder the engine was told to load.
	Path string `json:"path,omitempty"`
	// Attempts counts the failed attempts; Failure is the last one, and
	// Retrying tells whether another attempt follows (at RetryAt).
	Attempts int       `json:"attempts,omitempty"`
	Failure  *Failure  `json:"failure,omitempty"`
	FailedAt time.Time `json:"failedAt,omitzero"`
	Retrying bool      `json:"retrying,omitempty"`
	RetryAt  time.Time `json:"retryAt,omitzero"`
	// Fetch is the loader's summary of the adapter's files once fetched.
	Fetch *Summary `json:"fetch,omitempty"`
	// LoadedAt is when the engine loaded it.
	LoadedAt time.Time `json:"loadedAt,omitzero"`
}
