package localcluster

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddNodes adds the nodes of pool to the running cluster and waits until they are
// Ready and schedulable. The nodes are named <pool.Name>-<index>, taking the
// lowest indexes that are free, so a pool can grow more than once. It returns the
// names of the new nodes.
func (c *Cluster) AddNodes(ctx context.Context, pool NodePool) ([]string, error) {
	if err := pool.Validate(); err != nil {
		return nil, err
	}
	names, err := c.createNodes(ctx, pool)
	if err != nil {
		return names, err
	}
	return names, c.WaitNodesReady(ctx, names...)
}

// createNodes creates pool.Count nodes of pool, skipping names that exist. The
// nodes of a real pool are started on this host.
func (c *Cluster) createNodes(ctx context.Context, pool NodePool) ([]string, error) {
	if pool.Real {
		return c.startRealNodes(ctx, pool)
	}
	var names []string
	for index := 0; len(names) < pool.Count; index++ {
		node := pool.Node(index)
		_, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return names, fmt.Errorf("creating node %s: %w", node.Name, err)
		}
		names = append(names, node.Name)
	}
	return names, nil
}

// RemoveNode deletes a node and waits until it is gone. Pods bound to it are
// deleted by the controller-manager's pod garbage collector some time later; a
// test that needs them gone at once deletes them itself.
func (c *Cluster) RemoveNode(ctx context.Context, name string) error {
	err := c.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting node %s: %w", name, err)
	}
	return c.poll(ctx, "node "+name+" to be deleted", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// WaitNodesReady waits until the named nodes are Ready and schedulable: kwok has
// reported them Ready and the node lifecycle controller has lifted the
// not-ready taint.
func (c *Cluster) WaitNodesReady(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	pending := slices.Clone(names)
	return c.poll(ctx, fmt.Sprintf("%d nodes to be Ready", len(names)), func(ctx context.Context) (bool, error) {
		// A local cluster has few nodes: list them all rather than get them one by one.
		nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		byName := map[string]*corev1.Node{}
		for i := range nodes.Items {
			byName[nodes.Items[i].Name] = &nodes.Items[i]
		}
		pending = slices.DeleteFunc(pending, func(name string) bool {
			n, ok := byName[name]
			return ok && nodeSchedulable(n)
		})
		if len(pending) > 0 {
			return false, fmt.Errorf("not ready yet: %v", pending)
		}
		return true, nil
	})
}
