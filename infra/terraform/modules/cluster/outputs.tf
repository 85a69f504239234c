output "cluster_name" {
  description = "EKS cluster name."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint."
  value       = module.eks.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the Kubernetes API."
  value       = module.eks.cluster_certificate_authority_data
}

output "oidc_provider_arn" {
  description = "IAM OIDC provider of the cluster (IRSA trust)."
  value       = module.eks.oidc_provider_arn
}

output "node_security_group_id" {
  description = "Security group shared by every node (and so every pod under the VPC CNI)."
  value       = module.eks.node_security_group_id
}

output "gpu_pools" {
  description = "GPU pools by name: the node label value engine pods select, GPUs per node, and what Karpenter needs to launch them."
  value = { for name, g in var.gpu_node_groups : name => {
    gpus_per_node  = g.gpus_per_node
    instance_types = g.instance_types
    capacity_type  = g.capacity_type
    max_nodes      = g.max_size
    disk_size_gb   = g.disk_size_gb
  } }
}
