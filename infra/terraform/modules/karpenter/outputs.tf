output "node_role_name" {
  description = "IAM role of the nodes Karpenter launches (the EC2NodeClass's role)."
  value       = module.karpenter.node_iam_role_name
}
