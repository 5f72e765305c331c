// Package kubectlaii is the kubectl plugin kubectl-aii: it explains an
// AIInference from what the API server holds (the object, its Deployment, pods,
// nodes and events), with kubectl's standard flags (cli-runtime).
package kubectlaii

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// ReportAPIVersion is the apiVersion of what -o json|yaml prints.
const ReportAPIVersion = "kubectl-aii.serving.aiinference.io/v1"

// env is what a command needs: clients, the namespace, the output.
type env struct {
	ctx       context.Context
	c         client.Client
	cs        kubernetes.Interface
	namespace string
	out       io.Writer
	print     *genericclioptions.PrintFlags
}

// NewCommand is kubectl-aii with its subcommands.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:          "kubectl-aii",
		Short:        "Explain AIInference objects: status, why one is not Ready, its history and its logs; the nodes' model caches",
		SilenceUsage: true,
		Annotations:  map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl aii"},
	}
	flags.AddFlags(root.PersistentFlags())
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)

	newEnv := func(cmd *cobra.Command, pf *genericclioptions.PrintFlags) (*env, error) {
		cfg, err := flags.ToRESTConfig()
		if err != nil {
			return nil, err
		}
		ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return nil, err
		}
		c, err := client.New(cfg, client.Options{Scheme: scheme()})
		if err != nil {
			return nil, err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		return &env{ctx: cmd.Context(), c: c, cs: cs, namespace: ns, out: streams.Out, print: pf}, nil
	}
	withPrint := func(cmd *cobra.Command) *genericclioptions.PrintFlags {
		pf := genericclioptions.NewPrintFlags("").WithDefaultOutput("")
		pf.AddFlags(cmd)
		return pf
	}

	status := &cobra.Command{
		Use:   "status NAME",
		Short: "Phase, conditions, each replica (node, GPU, loader and engine state), the last load, the node cache's copies and the last failure with its fix",
		Args:  cobra.ExactArgs(1),
	}
	statusPrint := withPrint(status)
	status.RunE = func(cmd *cobra.Command, args []string) error {
		e, err := newEnv(cmd, statusPrint)
		if err != nil {
			return err
		}
		return e.status(args[0])
	}

	why := &cobra.Command{
		Use:   "why NAME",
		Short: "The chain from the AIInference to the child, container or event that keeps it from Ready, and what to do",
		Args:  cobra.ExactArgs(1),
	}
	whyPrint := withPrint(why)
	why.RunE = func(cmd *cobra.Command, args []string) error {
		e, err := newEnv(cmd, whyPrint)
		if err != nil {
			return err
		}
		return e.why(args[0])
	}

	trace := &cobra.Command{
		Use:   "trace NAME",
		Short: "A timeline of the object's phase changes, retries, loads and applied changes, from its events and status",
		Args:  cobra.ExactArgs(1),
	}
	tracePrint := withPrint(trace)
	trace.RunE = func(cmd *cobra.Command, args []string) error {
		e, err := newEnv(cmd, tracePrint)
		if err != nil {
			return err
		}
		return e.trace(args[0])
	}

	var loader bool
	var tail int64
	logs := &cobra.Command{
		Use:   "logs NAME",
		Short: "The engine's (or with --loader the model loader's) logs of the object's pods, each line prefixed with its pod",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := newEnv(cmd, nil)
			if err != nil {
				return err
			}
			return e.logs(args[0], loader, tail)
		},
	}
	logs.Flags().BoolVar(&loader, "loader", false, "Show the model loader's logs instead of the engine's.")
	logs.Flags().Int64Var(&tail, "tail", 100, "Lines of each pod's log to show; -1 for all.")

	cache := &cobra.Command{
		Use:   "cache",
		Short: "Every node's model cache (cache.type Node): each copy's namespace, source, size, state, pods and last use, and each node's use of its budget",
		Args:  cobra.NoArgs,
	}
	cachePrint := withPrint(cache)
	cache.RunE = func(cmd *cobra.Command, _ []string) error {
		e, err := newEnv(cmd, cachePrint)
		if err != nil {
			return err
		}
		return e.cache()
	}

	root.AddCommand(status, why, trace, logs, cache, pushCommand())
	return root
}

// scheme knows the built-in types, the AIInference API and the
// LeaderWorkerSets of models that span nodes.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(servingv1.AddToScheme(s))
	utilruntime.Must(lwsv1.AddToScheme(s))
	return s
}

// printStructured prints a report with -o json|yaml; false when no -o was given.
func (e *env) printStructured(kind string, report any) (bool, error) {
	if e.print == nil || e.print.OutputFormat == nil || *e.print.OutputFormat == "" {
		return false, nil
	}
	data, err := json.Marshal(report)
	if err != nil {
		return true, err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(data, &u.Object); err != nil {
		return true, err
	}
	u.SetAPIVersion(ReportAPIVersion)
	u.SetKind(kind)
	p, err := e.print.ToPrinter()
	if err != nil {
		return true, err
	}
	return true, p.PrintObj(u, e.out)
}

func (e *env) get(name string) (*servingv1.AIInference, error) {
	obj := &servingv1.AIInference{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.namespace, Name: name}, obj); err != nil {
		return nil, fmt.Errorf("getting AIInference %s/%s: %w", e.namespace, name, err)
	}
	return obj, nil
}
