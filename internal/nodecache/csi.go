package nodecache

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/internal/version"
)

// The pod's identity, which the kubelet adds to the volume attributes
// (CSIDriver podInfoOnMount) and which a pod cannot forge.
const (
	podNamespaceAttr = "csi.storage.k8s.io/pod.namespace"
	podNameAttr      = "csi.storage.k8s.io/pod.name"
	podUIDAttr       = "csi.storage.k8s.io/pod.uid"
	ephemeralAttr    = "csi.storage.k8s.io/ephemeral"
)

// plugin is the CSI identity and node service the kubelet calls.
type plugin struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer

	node    string
	store   *Store
	log     *slog.Logger
	metrics *metrics
	// published is told of each publish (the reporter writes the node's state
	// and an event on the pod).
	published func(ctx context.Context, r Request, p Published)
}

func (p *plugin) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: nodecachespec.DriverName, VendorVersion: version.Version}, nil
}

func (p *plugin) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil // a node service only
}

func (p *plugin) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (p *plugin) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil // no staging: a publish is a bind mount
}

func (p *plugin) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: p.node}, nil
}

// NodePublishVolume gives a pod its model cache volume. Only inline (ephemeral)
// volumes with the pod's identity are served: the copy's key needs the pod's
// namespace, which only the kubelet can vouch for.
func (p *plugin) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	attrs := req.GetVolumeContext()
	if attrs[ephemeralAttr] != "true" {
		return nil, status.Error(codes.InvalidArgument, nodecachespec.DriverName+" serves inline (ephemeral) pod volumes only")
	}
	r := Request{
		VolumeID: req.GetVolumeId(), Target: req.GetTargetPath(),
		Namespace: attrs[podNamespaceAttr], Pod: attrs[podNameAttr],
		Source: attrs[nodecachespec.AttrSource], Endpoint: attrs[nodecachespec.AttrEndpoint],
	}
	if r.Namespace == "" || r.Pod == "" {
		return nil, status.Error(codes.InvalidArgument, "the kubelet sent no pod identity: the CSIDriver object must set podInfoOnMount: true")
	}
	if r.Source == "" || r.Target == "" {
		return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q and a target path are required", nodecachespec.AttrSource)
	}
	for _, a := range []string{nodecachespec.AttrSource, nodecachespec.AttrEndpoint} {
		if len(attrs[a]) > nodecachespec.MaxAttrLength {
			return nil, status.Errorf(codes.InvalidArgument, "volume attribute %s is %d bytes long, more than the %d a model's source or endpoint may be", a, len(attrs[a]), nodecachespec.MaxAttrLength)
		}
	}
	if s := attrs[nodecachespec.AttrSizeBytes]; s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "volume attribute %s=%q is not a byte count", nodecachespec.AttrSizeBytes, s)
		}
		r.SizeBytes = n
	}
	if req.GetReadonly() {
		return nil, status.Error(codes.InvalidArgument, "the model cache volume is written by the pod's loader: mount it read-write in the pod and read-only in the engine's container")
	}
	res, err := p.store.Publish(r)
	if err != nil {
		p.log.Error("Publish failed", "pod", r.Namespace+"/"+r.Pod, "error", err)
		return nil, status.Error(codes.Internal, err.Error())
	}
	p.log.Info("Published", "pod", r.Namespace+"/"+r.Pod, "key", res.Key, "outcome", res.Outcome, "evicted", len(res.Evicted))
	p.metrics.published(res)
	if p.published != nil {
		p.published(ctx, r, res)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (p *plugin) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := p.store.Unpublish(req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("unpublishing %s: %v", req.GetVolumeId(), err))
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}
